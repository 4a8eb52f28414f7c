"""Several worker processes serving the same ports: what one worker needs to answer for the whole node."""
