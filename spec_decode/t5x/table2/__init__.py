"""gin configs: a package so that gin finds them under any install (its `include` reads packages)."""
