"""Learning: the Learner on its mesh, the data-parallel wrapper, the buffers that feed it, and the
program cache.
"""
