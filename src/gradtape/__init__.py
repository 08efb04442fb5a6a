"""gradtape: exact derivatives of plain NumPy code."""
