"""The Slack frontend: pure rendering, Slack I/O and turn following, in that order of layers."""
