cd . && terramate -C stacks/prod/cluster/a script run --no-recursive plan
