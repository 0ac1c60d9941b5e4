"""kvgraft application layer: services, CLI and wiring shared by the CLI and the desktop app."""
