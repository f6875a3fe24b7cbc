tofu apply -input=false -no-color -lock-timeout=1s tfstackplan.tfplan
