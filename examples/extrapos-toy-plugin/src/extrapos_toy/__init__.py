"""An example extrapos plug-in: ``encoding`` registers toy-log-bias, ``corpus`` serves toy-counting."""
