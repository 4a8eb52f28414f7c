"""Switchyard services: the inference gateway and the root command line."""
