cd . && terramate -C stacks/prod script run --no-recursive plan
