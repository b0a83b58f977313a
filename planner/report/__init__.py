"""Human-readable (rich) renderings of estimates and validation results."""
