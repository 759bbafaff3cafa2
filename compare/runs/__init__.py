"""Running the backends: their launches, processes, hosts and time limits, the run directory, the
common start of a twin or checkpoint, the extra runs (capture, second pass, noise floors), the live
display."""
