"""Checks the lab notebooks call on the learner's code (``md.labs.check_*``), and the lab builder."""
