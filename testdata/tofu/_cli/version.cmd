tofu version
