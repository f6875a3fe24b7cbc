cd . && terramate --chdir=stacks/nonprod/cluster/a script run --no-recursive plan
