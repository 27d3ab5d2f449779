"""Bayes by Backprop (Blundell et al. 2015; Shridhar et al. 2018): Gaussian-weight layers with local
reparameterisation, their KL terms and losses, and the LeNet-5 / AlexNet CNNs built from them."""
