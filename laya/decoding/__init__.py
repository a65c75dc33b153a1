"""Scores to System One answers, shared by both engines: calibrated probabilities, confidence and the
answer of each question type (`decode`), in floats summed the same way on every machine (`floats`)."""
