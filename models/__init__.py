"""Known checkpoints (the registry) and the generator of small test checkpoints.

Installed as `laya.models`.
"""
