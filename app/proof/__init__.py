"""What makes a stored state a proof: prompt formats, decode schedules, replay, the one Receipt type,
problems and the checker registry."""
