"""Acting on the host: the policy and its actors, the env runners and their group, evaluation, and
the host engine.
"""
