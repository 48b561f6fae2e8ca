"""The probe framework: the contract (probe.py), what a probe sees (context.py, topology.py),
the ordered list and selection (registry.py), running (runner.py), and the check report
(report.py). A probe's own module lives in mgft_doctor.probes."""
