"""HTTP layer: dependencies and one router per resource."""
