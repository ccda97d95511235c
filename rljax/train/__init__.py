"""Training: optimizer, jitted train steps, and the trainers (short loops over them)."""
