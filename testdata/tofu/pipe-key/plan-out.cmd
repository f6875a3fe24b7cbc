tofu plan -input=false -no-color -lock-timeout=0s -out=tfstackplan.tfplan
