"""``make bench``: impala_jax measured against references on the same machine, in one run.

Each module is a benchmark with a ``main(argv)`` that writes ``results/<name>.json``;
``run_all`` runs them in subprocesses and writes ``results/summary.json``. See README.md.
"""
