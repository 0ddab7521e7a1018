"""What a turn looks like in Slack: the projection of its events, mrkdwn, the reply
message's lifecycle and the working indicator."""
