tofu force-unlock -force b13ab70d-b953-7fbe-3f5a-8fc68068fd02
