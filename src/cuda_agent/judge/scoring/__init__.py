"""From measurements to a verdict's numbers: the speed-of-light bound, the milestone reward, the score."""
