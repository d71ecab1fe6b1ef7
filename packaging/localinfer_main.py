"""The bundle's entry point: the `localinfer` command, as pip installs it.

Opened from a file manager, the Dock or the Start menu (no arguments, no terminal on
stdin), it starts the desktop app rather than printing the command's help to nowhere.
"""

import sys

from localinfer.cli import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["__runner__"]:  # a model's runner process (backends/runner/child.py)
        from localinfer.backends.runner.child import runner_main

        runner_main()
        sys.exit(0)
    if sys.argv[1:2] == ["__attention_probe__"]:  # backends/native/attention_probe.py
        from localinfer.backends.native.attention_probe import main as probe_main

        sys.exit(probe_main(sys.argv[2:]))
    if len(sys.argv) == 1 and not (sys.stdin and sys.stdin.isatty()):
        sys.argv.append("app")
    main()
