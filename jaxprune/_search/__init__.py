"""How a threshold is found: exact counting passes over the weights, the brackets that
narrow a search, and the histogram and exact searches built on them."""
