"""The machine and the process lto runs in: the CPU and memory (`env`), an NVIDIA GPU (`gpu`), child
processes started, heard and ended (`child`), and Ctrl-C and signals (`interrupts`)."""
