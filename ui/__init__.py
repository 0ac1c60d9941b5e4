"""kvgraft desktop UI: PySide6 widgets only; reaches the engine and library through app/."""
