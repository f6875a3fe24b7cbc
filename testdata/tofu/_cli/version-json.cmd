tofu version -json
