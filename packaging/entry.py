"""The bundle's launcher script (PyInstaller needs a file): everything is in kvgraft.entry."""

from kvgraft.entry import bundle_main

if __name__ == "__main__":
    bundle_main()
