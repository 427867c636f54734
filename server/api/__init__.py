"""HTTP routes only: each route validates, calls the service, and shapes the reply."""
