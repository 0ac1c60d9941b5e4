"""kvgraft engine: the only package that talks to llama.cpp (through llama-cpp-python)."""
