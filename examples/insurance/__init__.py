"""The reference service: order insurance coverage through a durable task queue."""
