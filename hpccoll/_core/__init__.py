"""What every collective shares: argument checks (validate) and transport calls (launch)."""
