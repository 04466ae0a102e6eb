"""The CPU backend's performance policy: claims, layouts, prepared weights and measured choices."""
