"""Framework-free analysis of what the backends leave behind: their compiled programs (HLO text, one
reader) and the frameworks' compile logs (recompile causes). Backends and compare both read it."""
