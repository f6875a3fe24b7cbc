cd . && terramate -C stacks/nonprod/cluster/a script run --no-recursive plan
