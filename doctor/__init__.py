"""mgft-doctor: diagnose multi-GPU fine-tuning before it runs (probes) and after it fails (explain).

The package, one subpackage per subsystem (docs/architecture.md has the full map):

    errors.py, text.py   leaves: exit codes and error types; ANSI, CSV and flag helpers
    terminal.py          leaf: how every command prints (whole lines off a terminal)
    catalog/             known_errors/ as typed, validated data; fix choice; code pages
    explain/             log source -> lines -> scan -> failures -> match -> versions -> report -> render
    runconfig/           the user's run: LLaMA-Factory YAML, DeepSpeed JSON, model config, memory, rules
    launch/              every subprocess the doctor starts: time limits, process-tree kill, torchrun
    check/               the probe contract, context and facts, registry, runner, the check report
    probes/              (mgft_doctor.probes) one module per probe; workers/ run in the examined Python
    cli/                 one module per command: check, explain, codes, fix
    pytest_plugin/       the pytest11 entry; its __init__ imports only pytest and .state

Imports go one way (tests/test_layout.py keeps it true):

    errors, text, terminal  <-  catalog, explain, runconfig, launch  <-  check  <-  probes  <-  cli
    explain -> catalog is allowed (it matches against the catalog); the plugin reaches check,
    explain and launch lazily; probes/workers import nothing of the package.
"""

__version__ = "0.1.0"
