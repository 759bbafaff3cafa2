"""Explaining performance: compiled programs, profiles (XProf traces), per-backend figures."""
