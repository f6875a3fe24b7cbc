tofu apply -input=false -no-color -lock-timeout=0s tfstackplan.tfplan
