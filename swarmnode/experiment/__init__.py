"""Code that the tests and the benchmarks share; a running node never imports it.

It lives in the package because neither side may import the other (``benchmarks/`` never imports
``tests``, a test never imports ``benchmarks/``):

    processes    start real ``swarmnode`` processes on 127.0.0.1 and read what they write
    waiting      the one bounded poll (``wait_until``)
    soak, chaos  the long-run drivers behind ``benchmarks.soak`` / ``benchmarks.chaos`` and their short
                 versions in ``tests/integration``
    stats        a mean with its Student-t interval (scipy, from the ``test`` extra)
    sapo_report  the multi-seed SAPO table of ``benchmarks.sapo_table``

Importing this package loads nothing; each module imports what it needs. The process drivers start
``python -m swarmnode.cli`` from the repository root, so they need a source checkout.
"""
