"""Short-term demand forecasting for re-planning. Rule: pure functions on series of rates."""
