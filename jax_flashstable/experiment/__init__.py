"""Training experiments: the instability matrix (`instability`) and the main job (`compare`)."""
