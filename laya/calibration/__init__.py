"""Temperatures by bucket, confidence figures and (later) fitting and abstention."""
