"""Slack I/O: the Bolt apps and their listeners, the events endpoint, paced Web API calls
and the app manifest. Everything that talks to Slack's servers starts here."""
