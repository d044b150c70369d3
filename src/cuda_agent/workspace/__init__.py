"""The candidate's side: workspace layout, candidate files, and the incremental build."""
