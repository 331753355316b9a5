"""CCRk model: architecture, objectives, training, evaluation and export."""
