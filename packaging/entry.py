"""Entry point of the bundled app: no arguments opens the window, any argument runs the CLI."""

import sys


def main() -> None:
    if len(sys.argv) == 1 or all(a.endswith((".kvpack", ".jsonl", ".gguf")) for a in sys.argv[1:]):
        from ui.main_window import run  # no arguments, or files from a file manager: the window

        sys.exit(run())
    from app.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
