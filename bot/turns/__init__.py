"""Thread state: which Slack events start a turn in which session, and where each followed
turn stands (its checkpoint, kept in Redis), so a restarted bot picks up where it was."""
