"""Printers for every stage's artifact, shared by MINICOMPILE_DEBUG and the minicompile command."""
