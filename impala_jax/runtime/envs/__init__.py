"""Envs: envpool or gymnasium.vector behind one interface, resolving an env id, and envs written in
JAX.
"""
