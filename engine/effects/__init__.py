"""Effects: what a committed step asks for, run against the outside world (model
vendors, workers), each reporting back as one machine input."""
