"""Training: the algorithm (PPO with a critic over model tokens), episodes as token sequences, the stages."""
