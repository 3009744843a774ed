"""Tools that use both hybridnb and data_prep (not part of either library): the notebook
runner behind ``make demo`` and the Challenge score table."""
