cd . && terramate --chdir=stacks/prod/cluster/a script run --no-recursive plan
