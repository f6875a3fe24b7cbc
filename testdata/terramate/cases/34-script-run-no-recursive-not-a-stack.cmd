cd . && terramate --chdir=stacks/prod script run --no-recursive plan
